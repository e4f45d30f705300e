"""The applications, side by side on the library: the Table 2 chain (chain.py), Tables 3 / 4 and
Figure 6 (tables.py), the offline re-ranking tool (rerank.py) and the re-ranking server
(serve/). None imports another."""
