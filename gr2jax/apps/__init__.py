"""The applications, side by side on the library: the step runner of every stage and chain
(chain.py), Table 2 (table2.py: the chain's steps, then its rows), Tables 3 / 4 and Figure 6
(tables.py), the offline re-ranking tool (rerank.py) and the re-ranking server (serve/). None
imports another, but table2.py, which runs its steps through chain.py."""
