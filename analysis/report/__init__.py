"""What a reader sees: one module per notebook (``nbNN_*``: its figures and key numbers), the shared figure
style, the figures folder's registry, tables, the README's generated blocks and the notebook runner.
Reads results and judge; measures nothing."""
