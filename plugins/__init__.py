"""First-party plugins, registered through the same entry points a third-party plugin uses."""
