"""Choosing an algorithm and a segment size for a call.

selector      the choice: a measured tuning table, else the cost model
model         the α-β-γ cost model and its fit
default.json  the table shipped with ringtree (`python -m ringtree tune` writes others)
"""
