"""Estimator core: pure tensor math (torch, CPU or GPU), no model code, no I/O.

Each function names the paper quantity it computes; the paper's symbol is in its docstring.
Callers import from the module that computes a quantity (one home per name):
:mod:`.barycentre`, :mod:`.floors`, :mod:`.kmedian`, :mod:`.support` and :mod:`.truncation`
(the floors and what bounds them); :mod:`.aggregate` and :mod:`.concentration` (Hajek means,
the prompt bootstrap, intervals); :mod:`.risk`, :mod:`.serving`, :mod:`.served` and
:mod:`.topk` (risks, acceptance, served speed-ups); :mod:`.best_response` and :mod:`.mi`.
"""
