"""The blocks page's stacked bars drawn to an image file (``privsched budget show --plot``)."""

from __future__ import annotations

from pathlib import Path

from privsched.dashboard.bars import BUCKETS, budget_bar
from privsched.ledger import BlockInfo, DatasetInfo

#: One colour per bucket, shared with the web page's stylesheet.
COLOURS = {"consumed": "#c0392b", "allocated": "#e67e22", "unlocked": "#27ae60", "locked": "#bdc3c7"}
#: Blocks drawn per dataset before the figure summarises the rest in its title.
MAX_BARS = 200


def plain(text: str) -> str:
    """User text for matplotlib: ``$`` escaped so that a name never turns into math markup."""
    return text.replace("$", r"\$")


def plot_budgets(datasets: list[tuple[DatasetInfo, list[BlockInfo]]], path: str | Path) -> Path:
    """Write one panel per dataset, one horizontal bar per block (consumed, allocated,
    unlocked and locked shares of capacity at the block's reference dimension; retired blocks
    hatched). The format follows the file's suffix (png, svg, pdf)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    heights = [min(len(blocks), MAX_BARS) for _, blocks in datasets] or [1]
    figure, axes = plt.subplots(
        len(heights),
        1,
        squeeze=False,
        figsize=(8, 1.2 + 0.28 * sum(max(h, 2) for h in heights)),
        gridspec_kw={"height_ratios": [max(h, 2) for h in heights]},
    )
    for axis, (dataset, blocks) in zip(axes[:, 0], datasets):
        shown = blocks[:MAX_BARS]
        bars = [budget_bar(block, dataset.accounting) for block in shown]
        left = [0.0] * len(shown)
        for bucket in BUCKETS:
            widths = [getattr(bar, bucket) for bar in bars]
            drawn = axis.barh(range(len(shown)), widths, left=left, color=COLOURS[bucket], label=bucket)
            for patch, block in zip(drawn, shown):
                if block.state == "retired":
                    patch.set_alpha(0.35)
                    patch.set_hatch("//")
            left = [a + b for a, b in zip(left, widths)]
        axis.set_yticks(range(len(shown)), [plain(block.key) for block in shown], fontsize=7)
        axis.invert_yaxis()
        axis.set_xlim(0, 1)
        more = f" (first {MAX_BARS} of {len(blocks)} blocks)" if len(blocks) > MAX_BARS else ""
        axis.set_title(
            f"{plain(dataset.name)}: {dataset.accounting.name}, ε_G={dataset.epsilon:g}, δ_G={dataset.delta:g}{more}", fontsize=9
        )
        axis.set_xlabel("share of capacity (binding dimension; RDP: best order)", fontsize=8)
    axes[0, 0].legend(loc="lower right", fontsize=7, ncol=4)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
