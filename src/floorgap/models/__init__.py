"""Models: target materialisation and loading (``floorgap.models.targets``).

Import submodules explicitly; this package stays light so that importing it does not load
transformers.
"""
