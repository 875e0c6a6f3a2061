"""sandboxrun adapted to other frameworks: the blocking facade, the pytest plugin, the inspect_ai
provider. Nothing below imports this layer."""
