"""``lmr-qualify``: the qualification runner (see runner.py)."""
