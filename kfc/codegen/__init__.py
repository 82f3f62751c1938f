"""The backend: the stages from tile IR to CUDA C++ and cubin (backend.py), the emission rules
keyed by op class, PTX templates and the toolchain."""
