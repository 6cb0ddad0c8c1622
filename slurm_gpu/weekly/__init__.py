"""The weekly admin report: aggregation over the store, charts, HTML and JSON rendering.

This is the only package that imports pandas and matplotlib; import it lazily.
"""
