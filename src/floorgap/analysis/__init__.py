"""CPU analyses that turn probe records into analysis records (no model code, no plotting).

Each module reads record files, validates them, calls the estimators and returns tables that
the stage CLIs write; the report items then read only those tables.
"""
