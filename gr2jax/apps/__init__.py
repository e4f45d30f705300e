"""The applications, side by side on the library: Table 2 (table2.py: the chain's steps through
the step runner gr2jax/chain.py, then its rows), Tables 3 / 4 and Figure 6 (tables.py), the
offline re-ranking tool (rerank.py) and the re-ranking server (serve/). None imports another."""
