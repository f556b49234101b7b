#!/usr/bin/python3
"""plot_log.py: the loss curves of one or several train_kla runs, from their main.log files, as one PNG.

    /usr/bin/python3 scripts/plot_log.py [-o loss.png] [-t TOKENS_PER_STEP[,...]] LOG [LOG...]
    make plot LOG="log_a log_b/main.log" [PLOT_FLAGS="-t 8192"]

LOG is a main.log or a run directory holding one. main.log (README "Training output") has lines
`s:<step> trl:<train loss> lr:<lr> norm:<grad norm>`, `s:<step> tel:<val loss>` and `s:<step> evl:<loss> ...`
(--eval); keys other than trl, lr and tel are accepted and not drawn. The panels: train loss (thin) and val
loss (dots) against the step, the same against tokens when -t gives the tokens per step (the -d of the run,
one value for all logs or one per log), and the learning rate. Default output: loss.png beside the first log.
Needs matplotlib: Debian's python3-matplotlib (make plot installs it). Bad input is one line `error: ...`
naming the file (and line), exit code 1, and no PNG.
"""
import argparse
import os
import sys


def die(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(1)


def read_log(path):
    """{'trl': [(step, value)], 'tel': [...], 'lr': [...]} of one main.log; dies on a malformed line."""
    series = {"trl": [], "tel": [], "lr": []}
    try:
        lines = open(path, encoding="utf-8").read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        die(f"{path}: cannot read ({e.strerror if isinstance(e, OSError) else 'not UTF-8 text'})")
    for number, line in enumerate(lines, 1):
        fields = line.split()
        if not fields:
            continue
        try:
            key, step = fields[0].split(":")
            if key != "s" or len(fields) < 2:
                raise ValueError
            step = int(step)
            pairs = [field.split(":") for field in fields[1:]]
            values = {k: float(v) for k, v in pairs}
            if any(not k for k, _ in pairs):
                raise ValueError
        except ValueError:
            die(f"{path}:{number}: not a main.log line (s:<step> key:<number> ...): '{line[:60]}'")
        for k in series:
            if k in values:
                series[k].append((step, values[k]))
    if not series["trl"] and not series["tel"]:
        die(f"{path}: no train or val loss lines (s:<step> trl:... or s:<step> tel:...)")
    return series


def main():
    parser = argparse.ArgumentParser(description="main.log files -> a PNG of train and val loss and lr")
    parser.add_argument("logs", nargs="+", metavar="LOG", help="a main.log, or a run directory holding one")
    parser.add_argument("-o", dest="out", help="the PNG to write (default: loss.png beside the first log)")
    parser.add_argument("-t", dest="tokens", help="tokens per step (the run's -d): one for all logs, or one per log, comma-separated")
    parser.error = lambda message: die(message)  # one line, exit 1, as every bad input
    args = parser.parse_args()

    paths = [os.path.join(p, "main.log") if os.path.isdir(p) else p for p in args.logs]
    tokens = None
    if args.tokens is not None:
        try:
            tokens = [int(x) for x in args.tokens.split(",")]
            if any(t <= 0 for t in tokens):
                raise ValueError
        except ValueError:
            die(f"-t: expected positive whole numbers of tokens per step, got '{args.tokens}'")
        if len(tokens) == 1:
            tokens = tokens * len(paths)
        if len(tokens) != len(paths):
            die(f"-t: {len(tokens)} values for {len(paths)} logs (give one, or one per log)")
    out = args.out or os.path.join(os.path.dirname(paths[0]), "loss.png")
    runs = [read_log(p) for p in paths]
    # a run is named by its directory, or by the file when the logs share one
    dirs = [os.path.dirname(os.path.abspath(p)) for p in paths]
    names = [os.path.basename(d) if len(set(dirs)) == len(dirs) else p for d, p in zip(dirs, paths)]

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        die("matplotlib is missing (make plot installs Debian's python3-matplotlib; run this with /usr/bin/python3)")

    panels = ["step"] + (["tokens"] if tokens else []) + ["lr"]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5))
    for i, (run, name) in enumerate(zip(runs, names)):
        color = f"C{i % 10}"
        for ax, panel in zip(axes, panels):
            scale = tokens[i] if panel == "tokens" else 1
            if panel == "lr":
                if run["lr"]:
                    ax.plot([s for s, _ in run["lr"]], [v for _, v in run["lr"]], color=color, label=name)
                continue
            if run["trl"]:
                ax.plot([s * scale for s, _ in run["trl"]], [v for _, v in run["trl"]], color=color, lw=0.8, alpha=0.6, label=f"{name} train")
            if run["tel"]:
                ax.plot([s * scale for s, _ in run["tel"]], [v for _, v in run["tel"]], "o-", color=color, ms=4, label=f"{name} val")
    for ax, panel in zip(axes, panels):
        ax.set_xlabel({"step": "step", "tokens": "tokens", "lr": "step"}[panel])
        ax.set_ylabel("learning rate" if panel == "lr" else "loss (nats per token)")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(out, dpi=100)
    except OSError as e:
        die(f"-o {out}: cannot write ({e.strerror})")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
