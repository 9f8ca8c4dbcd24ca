#!/usr/bin/python3
"""Plots the latency curves of `sluice-bench-load --curve --json` as an SVG.

    sluice-bench-load --curve --json > curve.txt
    bench/plot_curves.py curve.txt -o docs/img/door-latency.svg [--subtitle TEXT]

Reads the benchmark's output (the last line that is a {"rows": [...]} object; other lines are
skipped, so the whole stdout can be given) and draws the rows whose "phase" is "curve": one panel
for the pinned points and one for the unpinned, x the load in percent of the door's own max,
y the latency (log scale), one line per door (colour) and percentile (p50 solid, p99 dashed,
p99.9 dotted). The legend gives each door's max checks/s in each pinning.

Standard library only (the machine's /usr/bin/python3 has no matplotlib): the SVG is written by
hand.
"""

import argparse
import json
import math
import sys
from xml.sax.saxutils import escape

DOOR_COLOURS = {
    "udp": "#1f77b4",
    "tcp": "#ff7f0e",
    "http": "#2ca02c",
    "grpc": "#d62728",
    "redis": "#9467bd",
}
PERCENTILES = [  # (field, label, dash pattern)
    ("p50_us", "p50", ""),
    ("p99_us", "p99", "7,4"),
    ("p999_us", "p99.9", "2,3"),
]


def read_rows(path):
    text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()
    rows = None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith('{"rows"'):
            rows = json.loads(line)["rows"]
    if rows is None:
        sys.exit(f"{path}: no {{\"rows\": ...}} line (run sluice-bench-load with --json)")
    return rows


def fmt_us(v):
    if v >= 1e6:
        return f"{v / 1e6:g} s"
    if v >= 1000:
        return f"{v / 1000:g} ms"
    return f"{v:g} µs"


def fmt_rate(v):
    if v >= 1e6:
        return f"{v / 1e6:.2f}M"
    if v >= 1e3:
        return f"{v / 1e3:.0f}k"
    return f"{v:.0f}"


class Svg:
    def __init__(self, width, height):
        self.width, self.height = width, height
        self.parts = []

    def add(self, s):
        self.parts.append(s)

    def text(self, x, y, s, size=12, anchor="start", weight="normal", colour="#222"):
        self.add(f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" '
                 f'font-weight="{weight}" fill="{colour}">{escape(s)}</text>')

    def line(self, x1, y1, x2, y2, colour="#222", width=1, dash=""):
        d = f' stroke-dasharray="{dash}"' if dash else ""
        self.add(f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" '
                 f'stroke="{colour}" stroke-width="{width}"{d}/>')

    def polyline(self, points, colour, width=2, dash=""):
        d = f' stroke-dasharray="{dash}"' if dash else ""
        pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        self.add(f'<polyline points="{pts}" fill="none" stroke="{colour}" '
                 f'stroke-width="{width}" stroke-linejoin="round"{d}/>')

    def circle(self, x, y, r, colour):
        self.add(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r}" fill="{colour}"/>')

    def render(self):
        head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" '
                f'height="{self.height}" viewBox="0 0 {self.width} {self.height}" '
                f'font-family="DejaVu Sans, Helvetica, Arial, sans-serif">\n'
                f'<rect width="100%" height="100%" fill="white"/>\n')
        return head + "\n".join(self.parts) + "\n</svg>\n"


def plot(rows, title, subtitle):
    curve = [r for r in rows if r.get("phase") == "curve"]
    if not curve:
        sys.exit("no curve rows (run sluice-bench-load with --curve --json)")
    maxes = {(r["target"], r["pinned"]): r["checks_per_sec"]
             for r in rows if r.get("phase") == "max" and "pinned" in r}
    doors = []
    for r in curve:
        if r["target"] not in doors:
            doors.append(r["target"])
    pinnings = [p for p in (True, False) if any(r["pinned"] == p for r in curve)]
    loads = sorted({r["load_pct"] for r in curve})

    values = [r[f] for r in curve for f, _, _ in PERCENTILES if r[f] > 0]
    lo = 10 ** math.floor(math.log10(min(values)))
    hi = 10 ** math.ceil(math.log10(max(values)))

    panel_w, panel_h = 430, 360
    left, top, gap = 80, 86, 70
    legend_h = 30 + 18 * len(doors)
    width = left + len(pinnings) * panel_w + (len(pinnings) - 1) * gap + 40
    height = top + panel_h + 60 + legend_h
    svg = Svg(width, height)
    svg.text(left, 30, title, size=17, weight="bold")
    if subtitle:
        svg.text(left, 52, subtitle, size=12, colour="#555")

    x_lo, x_hi = 0, max(loads) + 5

    for i, pinned in enumerate(pinnings):
        x0 = left + i * (panel_w + gap)
        y0 = top

        def px(load, x0=x0):
            return x0 + (load - x_lo) / (x_hi - x_lo) * panel_w

        def py(us, y0=y0):
            return y0 + panel_h - (math.log10(us) - math.log10(lo)) / (
                math.log10(hi) - math.log10(lo)) * panel_h

        svg.text(x0 + panel_w / 2, y0 - 10,
                 "pinned: sluiced on one CPU, generator on the other" if pinned
                 else "unpinned: both anywhere", size=13, anchor="middle", weight="bold")
        # Grid: every decade labelled, 2x and 5x faint.
        decade = lo
        while decade <= hi * 1.0001:
            svg.line(x0, py(decade), x0 + panel_w, py(decade), colour="#bbb")
            svg.text(x0 - 6, py(decade) + 4, fmt_us(decade), size=11, anchor="end")
            for m in (2, 5):
                if decade * m < hi:
                    svg.line(x0, py(decade * m), x0 + panel_w, py(decade * m), colour="#eee")
            decade *= 10
        for load in loads:
            svg.line(px(load), y0, px(load), y0 + panel_h, colour="#eee")
            svg.text(px(load), y0 + panel_h + 16, f"{load} %", size=11, anchor="middle")
        svg.line(x0, y0 + panel_h, x0 + panel_w, y0 + panel_h)
        svg.line(x0, y0, x0, y0 + panel_h)
        svg.text(x0 + panel_w / 2, y0 + panel_h + 36, "offered load, % of the door's max",
                 size=12, anchor="middle")
        if i == 0:
            svg.add(f'<text transform="translate({x0 - 62},{y0 + panel_h / 2}) rotate(-90)" '
                    f'font-size="12" text-anchor="middle" fill="#222">latency from the '
                    f'scheduled send (log scale)</text>')
        for door in doors:
            colour = DOOR_COLOURS.get(door, "#555")
            pts = sorted((r for r in curve if r["target"] == door and r["pinned"] == pinned),
                         key=lambda r: r["load_pct"])
            for field, _, dash in PERCENTILES:
                line = [(px(r["load_pct"]), py(max(r[field], lo))) for r in pts if r[field] > 0]
                if len(line) > 1:
                    svg.polyline(line, colour, width=2 if field != "p50_us" else 2.5, dash=dash)
                for x, y in line:
                    svg.circle(x, y, 2.5, colour)

    # Legend: doors (with their max), then the percentiles' line styles.
    ly = top + panel_h + 62
    svg.text(left, ly, "door (max checks/s, closed loop: "
             + " / ".join("pinned" if p else "unpinned" for p in pinnings) + ")",
             size=12, weight="bold")
    for j, door in enumerate(doors):
        y = ly + 18 * (j + 1)
        colour = DOOR_COLOURS.get(door, "#555")
        svg.line(left, y - 4, left + 28, y - 4, colour=colour, width=3)
        rates = " / ".join(fmt_rate(maxes[(door, p)]) if (door, p) in maxes else "-"
                           for p in pinnings)
        svg.text(left + 36, y, f"{door}  ({rates})", size=12)
    lx = left + 480
    svg.text(lx, ly, "percentile", size=12, weight="bold")
    for j, (_, label, dash) in enumerate(PERCENTILES):
        y = ly + 18 * (j + 1)
        svg.line(lx, y - 4, lx + 40, y - 4, colour="#333", width=2, dash=dash)
        svg.text(lx + 48, y, label, size=12)
    return svg.render()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("input", help="sluice-bench-load --curve --json output, or - for stdin")
    ap.add_argument("-o", "--out", default="-", help="SVG file (default: stdout)")
    ap.add_argument("--title", default="sluiced: latency at each door, open loop")
    ap.add_argument("--subtitle", default="", help="e.g. the date, commit and machine")
    args = ap.parse_args()
    svg = plot(read_rows(args.input), args.title, args.subtitle)
    if args.out == "-":
        sys.stdout.write(svg)
    else:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(svg)


if __name__ == "__main__":
    main()
