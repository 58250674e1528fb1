"""Reports: read records, write figures (PDF + PNG), tables (.tex + .csv) and paper values.

Reports never run models; every number they print comes from a record file.
"""
