"""The benchmarks behind ``floorgap bench``: each module one benchmark, rows of results out
(:mod:`floorgap.bench.timing`); the stage parses the options and prints the table."""
