"""lossgeom_book: what serves only the book *Same Function, Different Geometry*.

The results ledger, glue and plot style, the table-of-contents reader, the chapters'
data loading, and the toy models and experiments of the source documents, one module per
experiment. It builds on ``lossgeom``; ``lossgeom`` never imports it.
"""
