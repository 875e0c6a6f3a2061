"""The local backends' own pieces: the process-group backend and the bubblewrap/Landlock plan
both local backends confine with."""
