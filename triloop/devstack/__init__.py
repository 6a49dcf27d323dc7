"""Starting and stopping the one-machine stack (dev, demo and test fixtures share it)."""
