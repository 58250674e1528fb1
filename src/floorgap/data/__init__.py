"""Data: the domain registry and prompt sources (``domains``, ``sources``), the target-generated
corpus (``corpus``) and the stratified anchor sample (``anchors``)."""
