"""CLI: write the manifest (row counts, SHA-256) of a set of record files.

    python -m floorgap.manifest --out results/<target>/manifest.json FILE [FILE ...]
"""

from __future__ import annotations

import argparse

from floorgap.records import write_manifest


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m floorgap.manifest", description=__doc__)
    parser.add_argument("--out", required=True, help="manifest JSON to write")
    parser.add_argument("files", nargs="+", help="record files to list")
    args = parser.parse_args(argv)
    write_manifest(args.out, args.files)
    print(f"manifest of {len(args.files)} files -> {args.out}")


if __name__ == "__main__":
    main()
