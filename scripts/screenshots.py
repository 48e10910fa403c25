"""Make screenshots/ from the real app in demo mode: the main screen, a kill dialog, the reap dialog and the
device plot, and a MIG node (mig-node-80x24, mig-node-160x50: the demo with GPU 1 split by MIG), as SVG
(Textual) and PNG (converted with cairosvg, or rsvg-convert if cairosvg is missing).

    .venv/bin/python scripts/screenshots.py [--out screenshots] [--size 100x30] [--warmup 25]

The demo's processes are real and the history is real: the script lets the app sample for ``--warmup``
seconds first, so that the strips and the plot have something to show. PNGs look right only with the
"Fira Code" font installed (Debian: fonts-firacode), which the SVGs name.
"""

from __future__ import annotations

import argparse
import asyncio
import html
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gputop.core.config import Config  # noqa: E402
from gputop.core.demo import Demo  # noqa: E402
from gputop.core.sampler import Sampler  # noqa: E402
from gputop.tui.app import GputopApp  # noqa: E402


async def _wait(pilot, cond, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError("screenshots: timed out waiting for the app")
        await pilot.pause(0.05)


async def shoot(out: Path, size: tuple[int, int], warmup: float) -> list[Path]:
    svgs: list[Path] = []
    with Demo() as demo:
        config = Config()
        sampler = Sampler.open("simulated", str(demo.scenario_path), config)
        app = GputopApp(sampler, config=config, interval=0.5, demo=demo)

        def save(name: str) -> None:
            svgs.append(Path(app.save_screenshot(f"{name}.svg", str(out))))

        async with app.run_test(size=size) as pilot:
            await _wait(pilot, lambda: app.snapshot is not None)
            await pilot.pause(warmup)
            worker = demo.pid("worker0")
            assert app.select_key(f"gpu0/{worker}")
            await pilot.pause(0.3)
            save("main")
            await pilot.press("k")
            await _wait(pilot, lambda: type(app.screen).__name__ == "KillDialog")
            await pilot.pause(0.3)
            save("kill-dialog")
            await pilot.press("escape")
            retry = demo.pid("retry-worker")
            await _wait(pilot, lambda: app.select_key(f"gpu2/{retry}"))
            await pilot.press("r")
            await _wait(pilot, lambda: type(app.screen).__name__ == "ReapDialog")
            await pilot.pause(0.3)
            save("reap-dialog")
            await pilot.press("escape")
            assert app.select_key(f"gpu0/{worker}")
            await pilot.press("p")
            await _wait(pilot, lambda: type(app.screen).__name__ == "PlotScreen")
            await pilot.pause(0.5)
            save("device-plot")
            await pilot.press("escape")
        sampler.close()
    return svgs


async def shoot_mig(out: Path, warmup: float) -> list[Path]:
    """The demo as a MIG node (core.demo.mig_node), at 80x24 and 160x50."""
    svgs: list[Path] = []
    with Demo(mig=True) as demo:
        config = Config()
        sampler = Sampler.open("simulated", str(demo.scenario_path), config)
        for w, h in ((80, 24), (160, 50)):
            app = GputopApp(sampler, config=config, interval=0.5, demo=demo)
            async with app.run_test(size=(w, h)) as pilot:
                await _wait(pilot, lambda: app.snapshot is not None and app.snapshot.instances)
                await pilot.pause(warmup)
                assert app.select_key(f"gpu1/gi1ci0/{demo.pid('worker1')}")
                await pilot.pause(0.3)
                svgs.append(Path(app.save_screenshot(f"mig-node-{w}x{h}.svg", str(out))))
        sampler.close()
    return svgs


# Textual's SVG gives each span of text an x and a textLength; the PNG converters ignore textLength, so a
# span that runs across the screen (the plot's top lines) drifts by the font's advance against Textual's
# cell (0.61 em), and the frame's right edge came out as stray '|' marks beside the rows that are split
# into spans (issue 32). Each character is placed in its own cell before the conversion.
_SPAN = re.compile(r'<text class="([^"]*)" x="([0-9.]+)" y="([0-9.]+)" textLength="([0-9.]+)" '
                   r'clip-path="([^"]*)">([^<]*)</text>')


def one_cell_each(svg_text: str) -> str:
    """The SVG with every text span split into one element per character, each at its own cell."""
    def split(m: re.Match) -> str:
        cls, x, y, length, clip, body = m.groups()
        chars = html.unescape(body)
        if len(chars) <= 1:
            return m.group(0)
        w = float(length) / len(chars)
        return "".join(f'<text class="{cls}" x="{float(x) + i * w:.1f}" y="{y}" textLength="{w:.1f}" '
                       f'clip-path="{clip}">{html.escape(c)}</text>' for i, c in enumerate(chars) if c != "\xa0")

    return _SPAN.sub(split, svg_text)


def to_png(svg: Path) -> Path:
    png = svg.with_suffix(".png")
    data = one_cell_each(svg.read_text(encoding="utf-8")).encode("utf-8")
    try:
        import cairosvg
    except ImportError:
        exe = shutil.which("rsvg-convert")
        if exe is None:
            raise SystemExit("screenshots: install cairosvg (pip install '.[screenshots]') or rsvg-convert "
                             "(apt-get install librsvg2-bin) to make PNGs") from None
        subprocess.run([exe, "-o", str(png)], input=data, check=True)
        return png
    cairosvg.svg2png(bytestring=data, write_to=str(png))
    return png


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "screenshots"))
    ap.add_argument("--size", default="100x30", help="terminal size, WxH")
    ap.add_argument("--warmup", type=float, default=25.0, help="seconds of history before the first shot")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    w, h = (int(x) for x in args.size.split("x"))
    for svg in asyncio.run(shoot(out, (w, h), args.warmup)) + asyncio.run(shoot_mig(out, min(args.warmup, 8.0))):
        print(to_png(svg))
    return 0


if __name__ == "__main__":
    sys.exit(main())
