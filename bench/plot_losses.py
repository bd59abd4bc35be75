"""Loss curves of strata trainer logs, as an SVG picture and a table (no dependencies).

    python3 bench/plot_losses.py --out curves.svg --reference bf16 --from 200 bf16=a.log tensorwise=b.log

Reads the log lines "iteration N/ M | loss X | ... | T tokens/s | ..." of each NAME=LOG. Prints a
markdown table: per curve the last logged loss, the mean tokens/s of the lines after the first two,
and, against the reference curve at the same iterations after --from, the largest and the mean
relative distance |loss - reference| / reference, the mean signed distance (loss - reference) /
reference (below zero: the curve lies under the reference), the largest distance between the
means over windows of --window iterations (100 by default: what is left once the noise of single
batches is averaged out), and how many logged points lie farther than --bound percent (1 by
default). Writes the curves (loss against iteration) to --out.

With --validation it reads the lines "validation N/ M | loss X" instead (the loss on the same
held-out batches at every --eval-interval, the same for every run), and compares those curves the
same way; --window then averages the evaluations that fall in each window.

With --band NAME,NAME,... (runs of the reference's precision that differ by rounding alone, such as
bf16 and bf16 with the non-deterministic attention backward) it prints a second table: each other
curve's distance from the band those runs span at each point (zero inside it; outside it, the
distance from the nearer edge relative to that edge), its largest value after --from and how many
points lie farther than --bound percent. Two runs of one precision are both that precision's curve;
the band is as much of "the bf16 curve" as the runs can pin down.
"""
import argparse
import re
import sys

LINE = re.compile(r"iteration\s+(\d+)/\s*\d+ \| loss ([\d.eE+-]+|nan|inf)(?:.*?\|\s+(\d+) tokens/s)?")
VALIDATION = re.compile(r"^validation\s+(\d+)/\s*\d+ \| loss ([\d.eE+-]+|nan|inf)")
COLOURS = ["#1f4e9c", "#c8402a", "#2a8c4a", "#8a4fb0", "#b08a1f", "#333333", "#17a2b8", "#e377c2", "#7f7f7f",
           "#9acd32", "#ff7f0e", "#8c564b", "#00008b", "#d62728"]  # distinct up to 14 curves, then repeated


def read(path, validation=False):
    points, rates = [], []
    for line in open(path, errors="replace"):
        m = LINE.search(line)
        if m and m.group(3):
            rates.append(float(m.group(3)))
        if validation:
            m = VALIDATION.search(line)
        if m:
            points.append((int(m.group(1)), float(m.group(2))))
    return points, rates


def svg(curves, path, title, ylabel):
    width, height, left, right, top, bottom = 900, 520, 70, 170, 40, 50
    xs = [i for pts in curves.values() for i, _ in pts]
    ys = [v for pts in curves.values() for _, v in pts if v == v and v < float("inf")]
    if not xs or not ys:
        return
    x0, x1 = min(xs), max(xs)
    ys_sorted = sorted(ys)
    y0, y1 = ys_sorted[0], ys_sorted[int(0.98 * (len(ys_sorted) - 1))]  # the first steps' losses off the top
    y1 = y1 if y1 > y0 else y0 + 1

    def px(i):
        return left + (i - x0) / max(x1 - x0, 1) * (width - left - right)

    def py(v):
        return top + (1 - (min(v, y1) - y0) / (y1 - y0)) * (height - top - bottom)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">',
             f'<rect width="{width}" height="{height}" fill="white"/>',
             f'<text x="{left}" y="22" font-size="14">{title}</text>',
             f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" stroke="black"/>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="black"/>']
    for k in range(6):
        v = y0 + k * (y1 - y0) / 5
        parts.append(f'<text x="{left - 8}" y="{py(v) + 4:.1f}" text-anchor="end">{v:.3f}</text>')
        parts.append(f'<line x1="{left}" y1="{py(v):.1f}" x2="{width - right}" y2="{py(v):.1f}" stroke="#ddd"/>')
        i = x0 + k * (x1 - x0) / 5
        parts.append(f'<text x="{px(i):.1f}" y="{height - bottom + 18}" text-anchor="middle">{i:.0f}</text>')
    parts.append(f'<text x="{(left + width - right) / 2}" y="{height - 10}" text-anchor="middle">iteration</text>')
    parts.append(f'<text x="16" y="{(top + height - bottom) / 2}" transform="rotate(-90 16 {(top + height - bottom) / 2})" '
                 f'text-anchor="middle">{ylabel}</text>')
    for n, (name, pts) in enumerate(curves.items()):
        colour = COLOURS[n % len(COLOURS)]
        line = " ".join(f"{px(i):.1f},{py(v):.1f}" for i, v in pts if v == v and v < float("inf"))
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.4" points="{line}"/>')
        parts.append(f'<line x1="{width - right + 15}" y1="{top + 20 * n + 6}" x2="{width - right + 40}" '
                     f'y2="{top + 20 * n + 6}" stroke="{colour}" stroke-width="2"/>')
        parts.append(f'<text x="{width - right + 46}" y="{top + 20 * n + 10}">{name}</text>')
    parts.append("</svg>")
    open(path, "w").write("\n".join(parts) + "\n")


def band_table(curves, names, start, bound):
    missing = [n for n in names if n not in curves]
    if len(names) < 2 or missing:
        print(f"\nno band: --band needs two runs or more among the curves (missing: {', '.join(missing) or 'none'})")
        return
    runs = [dict(curves[n]) for n in names]
    common = sorted(set.intersection(*(set(r) for r in runs)))
    low = {i: min(r[i] for r in runs) for i in common}
    high = {i: max(r[i] for r in runs) for i in common}
    spread = [(high[i] - low[i]) / low[i] for i in common if i > start and low[i] > 0]
    print(f"\n| run | distance from the band of {' / '.join(names)} after {start}: largest | mean "
          f"| points beyond {bound:g}% |")
    print("|---|---|---|---|")
    if spread:
        print(f"| (the band's own width) | {100 * max(spread):.2f}% | {100 * sum(spread) / len(spread):.2f}% "
              f"| {sum(w > bound / 100 for w in spread)} of {len(spread)} |")
    for name, pts in curves.items():
        if name in names:
            continue
        dist = []
        for i, v in pts:
            if i <= start or i not in low or low[i] <= 0:
                continue
            dist.append((low[i] - v) / low[i] if v < low[i] else (v - high[i]) / high[i] if v > high[i] else 0.0)
        if not dist:
            print(f"| {name} | - | - | no points in common |")
            continue
        print(f"| {name} | {100 * max(dist):.2f}% | {100 * sum(dist) / len(dist):.2f}% "
              f"| {sum(d > bound / 100 for d in dist)} of {len(dist)} |")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--reference", required=True)
    p.add_argument("--from", dest="start", type=int, default=200)
    p.add_argument("--window", type=int, default=100, help="iterations per window of the windowed distance")
    p.add_argument("--bound", type=float, default=1.0, help="percent: count the logged points farther than this")
    p.add_argument("--title", default=None, help="the picture's title")
    p.add_argument("--validation", action="store_true", help="the validation loss lines instead of the training loss's")
    p.add_argument("--band", default=None, help="NAME,NAME,...: runs whose pointwise span is the reference band")
    p.add_argument("curves", nargs="+", help="NAME=LOG")
    a = p.parse_args()
    curves, rates = {}, {}
    for spec in a.curves:
        name, _, path = spec.partition("=")
        curves[name], rates[name] = read(path, a.validation)
    ref = dict(curves.get(a.reference, []))
    what = "evaluations" if a.validation else "iterations logged"
    print(f"| run | {what} | last loss | tokens/s | max relative distance from {a.reference} after {a.start} | mean "
          f"| mean signed | max over {a.window}-iteration means | points beyond {a.bound:g}% |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, pts in curves.items():
        r = rates[name][2:] or rates[name]
        rate = f"{sum(r) / len(r):,.0f}" if r else "-"
        last = f"{pts[-1][1]:.4f} (it. {pts[-1][0]})" if pts else "no loss lines"
        pairs = [(i, v, ref[i]) for i, v in pts if i > a.start and i in ref and ref[i] > 0]
        dist = [abs(v - w) / w for _, v, w in pairs]
        signed = [(v - w) / w for _, v, w in pairs]
        windows = {}
        for i, v, w in pairs:  # window k holds the logged points of iterations (start + k W, start + (k + 1) W]
            windows.setdefault((i - a.start - 1) // a.window, []).append((v, w))
        far_window = [abs(sum(v for v, _ in ws) - sum(w for _, w in ws)) / sum(w for _, w in ws) for ws in windows.values()]
        own = name == a.reference or not dist
        far = "-" if own else f"{100 * max(dist):.2f}%"
        mean = "-" if own else f"{100 * sum(dist) / len(dist):.2f}%"
        mean_signed = "-" if own else f"{100 * sum(signed) / len(signed):+.2f}%"
        window = "-" if own else f"{100 * max(far_window):.2f}%"
        beyond = "-" if own else f"{sum(d > a.bound / 100 for d in dist)} of {len(dist)}"
        print(f"| {name} | {len(pts)} | {last} | {rate} | {far} | {mean} | {mean_signed} | {window} | {beyond} |")
    if a.band:
        band_table(curves, a.band.split(","), a.start, a.bound)
    kind = "validation loss" if a.validation else "loss per iteration"
    svg(curves, a.out, a.title or f"strata GPT 350M, one GPU: {kind}",
        "validation loss (the same held-out batches)" if a.validation else "loss (mean of the log interval)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
