"""The execution loop: environments, sandboxed episodes and step-level trajectories.

It turns in seconds (observe, act, the environment changes, observe again) and may
never change an environment contract, a reward rule or an eval set.
"""
