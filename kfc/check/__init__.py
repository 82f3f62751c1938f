"""`kfc check`: run an op through the interpreter and its reference on fresh random inputs."""
