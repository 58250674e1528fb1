"""``floorgap paper --tex paper/main.tex --out paper/main.pdf [--log LOG]``

Compile the paper with latexmk in the folder of the generated tables and values (the output's
folder), with the text from the repository. A missing latexmk is a one-line error naming the
packages to install.
"""

from __future__ import annotations

import argparse
import logging
import re
import shutil
import subprocess
from pathlib import Path

from floorgap.errors import StageError
from floorgap.stages._cli import stage_parser

TEX_PACKAGES = "texlive-latex-base texlive-latex-extra latexmk"


def build_parser() -> argparse.ArgumentParser:
    parser = stage_parser("floorgap paper", "Compile paper/main.tex with latexmk.", spec=False)
    parser.add_argument("--tex", required=True, type=Path, help="the paper's main .tex file")
    parser.add_argument("--out", required=True, type=Path,
                        help="the PDF to produce; latexmk runs in its folder")
    return parser


def main(args: argparse.Namespace, logger: logging.Logger) -> None:
    latexmk = shutil.which("latexmk")
    if latexmk is None:
        raise StageError(f"latexmk not found: install it with `sudo apt-get install "
                         f"{TEX_PACKAGES}` (bash envs/install.sh does this as root)")
    workdir = args.out.parent.resolve()
    tex = args.tex.resolve()
    cmd = [latexmk, "-pdf", "-interaction=nonstopmode", "-halt-on-error",
           f"-jobname={args.out.stem}", str(tex)]
    proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, check=False)
    logger.info("latexmk output:\n%s", proc.stdout[-20000:])
    if proc.returncode != 0:
        raise StageError(f"latexmk exited with status {proc.returncode}; see the log above "
                         f"({workdir / (args.out.stem + '.log')})")
    boxes = overfull_boxes((workdir / (args.out.stem + ".log")).read_text(errors="replace"))
    wide = [b for b in boxes if b[0] > OVERFULL_PT]
    logger.info("overfull boxes: %d, %d wider than %g pt%s", len(boxes), len(wide), OVERFULL_PT,
                "".join(f"\n  {pt:.1f} pt too wide at {where}" for pt, where in boxes))
    logger.info("wrote %s", args.out)


#: A box that sticks out by more than this is visible on the page (the paper's bar).
OVERFULL_PT = 5.0


def overfull_boxes(log_text: str) -> list[tuple[float, str]]:
    """The overfull horizontal boxes of a LaTeX log: (points too wide, where), widest first."""
    found = re.findall(r"Overfull \\hbox \(([\d.]+)pt too wide\) (.*)", log_text)
    return sorted(((float(pt), where.strip()) for pt, where in found), reverse=True)
