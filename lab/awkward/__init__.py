"""Awkward inputs, tried as a user would (issue 40): each family module (attention.py, scans.py,
cells.py) draws cases a grid never holds (T = 1, odd sizes, Sq != Skv, empty sequences, resets at
the edges, extreme gates, padded layouts) and checks our op on them against float64 and PyTorch
eager with common.check; `python -m lab.awkward` sweeps them over worker processes (__main__.py)."""
