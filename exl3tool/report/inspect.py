"""`exl3tool inspect` as text: a facts table, the K histogram per projection and the tiers."""

from __future__ import annotations

from typing import Any

SHOWN_MAX = 200  # characters of one value a table shows (a manifest's strings are its author's)


def _shown(value: Any) -> str:
    """A value as one printable cell: control characters escaped, long text cut."""
    text = str(value)
    if not text.isprintable():
        text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)
    return text if len(text) <= SHOWN_MAX else text[: SHOWN_MAX - 1] + "…"


def _short(digest: Any) -> str:
    return f"{digest[:16]}…" if isinstance(digest, str) and len(digest) > 16 else str(digest)


def _cartridge_facts(info: dict[str, Any]) -> list[tuple[str, str]]:
    layers = info.get("layers") or []
    base = info.get("base") or {}
    pin = base.get("compatibility_sha256")
    rows = [
        ("kind", f"{info['kind']} ({info.get('schema')})"),
        ("shards / tensors", f"{info['shards']} / {info['tensors']}"),
        ("payload bytes", f"{info['bytes']:,}"),
        ("file bytes", f"{info['file_bytes']:,}"),
        ("layers", ", ".join(map(str, layers)) if layers else "none"),
        ("experts with stages", str(info.get("experts", 0))),
        ("base", f"{base.get('label')}, K {base.get('k')}, identity {_short(pin)}"),
        ("layout", f"{info.get('layout')}, world size {info.get('world_size')}"),
        ("codebook", str(info.get("codebook"))),
    ]
    for st in info.get("chain") or []:
        rows.append(
            (
                f"stage {st.get('label')}",
                f"+{st.get('k')} bits on {st.get('parent')}, {st.get('experts')} experts",
            )
        )
    return rows


def _facts(info: dict[str, Any]) -> list[tuple[str, str]]:
    if "chain" in info:
        return _cartridge_facts(info)
    rows = [("kind", info["kind"])]
    if "tensors" in info:
        layers = info.get("layers") or []
        span = f"{layers[0]}..{layers[-1]} ({len(layers)})" if layers else "none"
        rows += [
            ("shards / tensors", f"{info['shards']} / {info['tensors']}"),
            ("payload bytes", f"{info['bytes']:,}"),
            ("file bytes", f"{info['file_bytes']:,}"),
            ("routed-expert layers", span),
            ("experts per layer", str(info.get("experts", 0))),
        ]
        if info.get("routed_bpw") is not None:
            rows.append(("routed bits per weight", f"{info['routed_bpw']:.4g}"))
    return rows


def print_inspect(info: dict[str, Any]) -> None:
    """Print the description with rich (tables fit the terminal, 80 columns when piped)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    table = Table(title=f"exl3tool inspect {escape(info['path'])}", show_header=False)
    table.add_column("field", no_wrap=True)
    table.add_column("value", overflow="fold")
    for k, v in _facts(info):
        table.add_row(escape(_shown(k)), escape(_shown(v)))
    console.print(table)
    hist = info.get("k_histogram") or {}
    ks = sorted({k for h in hist.values() for k in h}, key=int)
    if ks:
        kt = Table(title="K histogram per projection")
        kt.add_column("projection")
        for k in ks:
            kt.add_column(f"K={k}", justify="right")
        for proj, h in hist.items():
            kt.add_row(proj, *(str(h.get(k, 0)) for k in ks))
        console.print(kt)
    tiers = info.get("tiers") or {}
    if tiers:
        counts: dict[int, list[str]] = {}
        for layer, t in tiers.items():
            counts.setdefault(t, []).append(layer)
        tt = Table(title="tier per layer", caption="tier = distinct K across gate/up/down")
        tt.add_column("tier", justify="right")
        tt.add_column("layers", overflow="fold")
        for t, layers in sorted(counts.items()):
            tt.add_row(str(t), ", ".join(layers))
        console.print(tt)
