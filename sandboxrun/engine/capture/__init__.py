"""A run's output: the bounded head/tail buffer, the spill files and their pruning, the
pipes, the secret masking."""
