"""Compute kernels (numba, OpenMP, Triton) behind one interface."""
