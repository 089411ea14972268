"""
The paper study: grids of variants x seeds trained with train.py, their paired statistics and
figures, and the committed results (study/README.md: the claims; study/NOTES.md: the lab notebook
of each round's predictions and scores). Run from the repository's root:

    python -m study.reproduce --help

reproduce.py runs a grid; grids.py names the grids (variants, their baselines and claims);
report.py holds the statistics and reports; plots.py the figures. They import the core, never
tools/.
"""
