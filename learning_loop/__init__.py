"""The learning loop: trajectories -> advantages -> GRPO policy update -> checkpoint -> proposal.

Nothing is imported here on purpose: `learning_loop.workflows` must stay free of torch, and
importing the package must not pull in the torch modules (`objective`, `update`, `batch`,
`checkpoints`). Import the submodule you need.
"""
