"""Estimator core: pure tensor math (torch, CPU or GPU), no model code, no I/O.

Each function names the paper quantity it computes; the paper's symbol is in its docstring.
"""
