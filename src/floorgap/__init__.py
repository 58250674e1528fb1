"""floorgap: information floors and model gaps in block drafting.

Estimators (``floorgap.estimators``) are pure tensor math; probes run models and write
records; reports read records and draw. See DESIGN in the repository's README.
"""

__version__ = "0.1.0"
