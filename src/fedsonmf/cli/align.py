"""``fedsonmf flower align``: organisations' files of different samples, aligned by keyed tags of
their ids, for a federation between separate machines (:mod:`fedsonmf.datasets.linkage`).

    [each organisation]  fedsonmf flower align key link.key            # one of them; shared among them only
    [each organisation]  fedsonmf flower align tags view.csv --key link.key --out hospA.tags.json
    [coordinator]        fedsonmf flower align positions hospA.tags.json hospB.tags.json --out-dir pos
    [each organisation]  fedsonmf flower align view view.csv --key link.key --positions hospA.positions.json \\
                             --out aligned
    [each organisation]  fedsonmf flower supernode ... --view aligned/view.npy --mask aligned/view.mask.npy
    [each organisation]  fedsonmf flower align labels labels.csv view.csv --key link.key \
                             --positions hospA.positions.json --out clusters.csv   # its samples, its ids
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from fedsonmf.cli.options import CONTEXT


def register(flower_app, fail) -> None:
    """Add ``flower align`` and its commands to ``flower_app``; ``fail`` ends a command with one error line."""
    align_app = typer.Typer(help="Align organisations' files of different samples by keyed tags of their ids "
                                 "(separate machines; the coordinator never sees an id).",
                            no_args_is_help=True, context_settings=CONTEXT)
    flower_app.add_typer(align_app, name="align")

    @align_app.command("key")
    def key(path: Path = typer.Argument(..., help="Where to write the new linkage key (0600).")):
        """Create the federation's linkage key: give it to every organisation, never to the coordinator."""
        from fedsonmf.datasets.linkage import new_key
        from fedsonmf.exceptions import InputError

        try:
            new_key(path)
        except (InputError, OSError) as exc:
            fail(exc)
        typer.echo(f"wrote linkage key {path} (0600): copy it to every organisation of the federation over a "
                   "private channel, never to the coordinator")

    @align_app.command("tags")
    def tags(
        view: Path = typer.Argument(..., help="This organisation's view file, with sample ids (an id column or "
                                    "<stem>.ids.txt)."),
        key_path: Path = typer.Option(..., "--key", help="The federation's linkage key."),
        out: Path = typer.Option(..., "--out", "-o", help="The tags file to send the coordinator (JSON, 0600)."),
    ):
        """Tag this organisation's sample ids with the linkage key (HMAC-SHA256), for the coordinator."""
        from fedsonmf.datasets.files import read_view
        from fedsonmf.datasets.linkage import id_tags, read_key, write_tags
        from fedsonmf.exceptions import InputError

        try:
            key_bytes = read_key(key_path)
            _, ids = read_view(view, mmap_mode="r", validate=False)
            if ids is None:
                raise InputError(f"{view} carries no sample ids: add an id column or {view.stem}.ids.txt")
            write_tags(out, id_tags(ids, key_bytes))
        except (InputError, OSError) as exc:
            fail(exc)
        typer.echo(f"wrote {len(ids)} tags to {out}: send it to the coordinator (it holds no id)")

    @align_app.command("positions")
    def positions_cmd(
        tag_files: list[Path] = typer.Argument(..., help="Every organisation's tags file (NAME.tags.json)."),
        out_dir: Path = typer.Option(..., "--out-dir", "-o", help="Folder for one NAME.positions.json per "
                                     "organisation (0700, files 0600)."),
    ):
        """Coordinator: order all samples by their tags; each organisation gets only n and its own positions."""
        from fedsonmf._io import new_private_dir
        from fedsonmf.datasets.linkage import positions, read_tags, write_positions
        from fedsonmf.exceptions import InputError

        names = [f.name.removesuffix(".json").removesuffix(".tags") for f in tag_files]
        try:
            if len(set(names)) < len(names):
                raise InputError(f"two tags files have the same name ({', '.join(names)}): name each by its "
                                 "organisation")
            lists = [read_tags(f) for f in tag_files]
            n, pos = positions(lists)
            out_dir = new_private_dir(out_dir)
            written = [write_positions(out_dir / f"{name}.positions.json", n, p, t)
                       for name, p, t in zip(names, pos, lists)]
        except (InputError, OSError) as exc:
            fail(exc)
        typer.echo(f"{n} samples in all; " + ", ".join(f"{name} holds {len(t)}" for name, t in zip(names, lists)))
        for path in written:
            typer.echo(f"wrote {path}: send it to its organisation only")

    @align_app.command("view")
    def view_cmd(
        view: Path = typer.Argument(..., help="This organisation's view file, with sample ids (as tagged)."),
        key_path: Path = typer.Option(..., "--key", help="The federation's linkage key."),
        positions_path: Path = typer.Option(..., "--positions", help="This organisation's NAME.positions.json "
                                            "from the coordinator."),
        out: Path = typer.Option(..., "--out", "-o", help="Folder for the aligned view and its mask (0700, files "
                                 "0600): view.npy (view.npz when sparse) and view.mask.npy."),
    ):
        """Place this organisation's rows at the coordinator's positions: the view and mask its SuperNode serves."""
        import numpy as np
        import scipy.sparse as sp

        from fedsonmf._io import new_private_dir, save_npy_atomic, write_atomic
        from fedsonmf.datasets.files import read_view
        from fedsonmf.datasets.linkage import aligned_view, read_key, read_positions
        from fedsonmf.exceptions import InputError

        try:
            key_bytes = read_key(key_path)
            n, pos, digest = read_positions(positions_path)
            X, ids = read_view(view)
            if ids is None:
                raise InputError(f"{view} carries no sample ids: add an id column or {view.stem}.ids.txt")
            Y, mask = aligned_view(X, ids, key_bytes, n, pos, digest)
            out = new_private_dir(out)  # the raw view, rearranged: as private as the file it came from
            if sp.issparse(Y):
                path = write_atomic(out / "view.npz", lambda fh: sp.save_npz(fh, sp.csr_matrix(Y)))
            else:
                path = save_npy_atomic(out / "view.npy", np.asarray(Y, dtype=np.float64))
            mask_path = save_npy_atomic(out / "view.mask.npy", mask)
        except (InputError, OSError) as exc:
            fail(exc)
        typer.echo(f"wrote {path} ({n} samples, {int(np.count_nonzero(mask))} held here) and its mask "
                   f"{mask_path}: start this organisation's SuperNode with --view {path} --mask {mask_path}")

    @align_app.command("labels")
    def labels_cmd(
        run_labels: Path = typer.Argument(..., help="The run's labels.csv (sample_id,cluster with the rows 0..n-1 "
                                          "of the nodes' order), as the coordinator shares it."),
        view: Path = typer.Argument(..., help="This organisation's view file, with its sample ids."),
        out: Path = typer.Option(..., "--out", "-o", help="CSV sample_id,cluster of this organisation's samples, "
                                 "by its own ids (0600)."),
        key_path: Optional[Path] = typer.Option(None, "--key", help="The linkage key, for files aligned with "
                                                "`align view`."),
        positions_path: Optional[Path] = typer.Option(None, "--positions", help="This organisation's "
                                                      "NAME.positions.json, for files aligned with `align view`."),
    ):
        """This organisation's samples' clusters by its own ids, from the run's labels.csv."""
        from fedsonmf.datasets.files import read_view, write_assignments
        from fedsonmf.datasets.linkage import own_rows, read_key, read_positions
        from fedsonmf.exceptions import InputError

        try:
            if (key_path is None) != (positions_path is None):
                raise InputError("give --key and --positions together (files aligned with `align view`), or neither")
            labels = _read_run_labels(run_labels)
            _, ids = read_view(view, mmap_mode="r", validate=False)
            if ids is None:
                raise InputError(f"{view} carries no sample ids: line i of {run_labels.name} is row i of the file")
            if key_path is None:
                mine, rows = own_rows(ids, labels.size)
            else:
                n, pos, digest = read_positions(positions_path)
                if n != labels.size:
                    raise InputError(f"{run_labels} has {labels.size} samples, the positions file {n}")
                mine, rows = own_rows(ids, n, read_key(key_path), pos, digest)
            write_assignments(out, mine, labels[rows])
        except (InputError, OSError) as exc:
            fail(exc)
        typer.echo(f"wrote {out}: the clusters of this organisation's {len(mine)} samples, by its ids")


def _read_run_labels(path: Path):
    """The clusters of a run's ``labels.csv`` (``sample_id,cluster``, ids 0..n-1), in row order."""
    import numpy as np

    from fedsonmf.exceptions import InputError

    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        raise InputError(f"labels file {path} does not exist") from None
    try:
        pairs = sorted((int(a), int(b)) for a, b in (line.split(",") for line in lines[1:] if line.strip()))
    except ValueError:
        raise InputError(f"{path} is not a run's labels.csv (sample_id,cluster lines of integers)") from None
    if lines[:1] != ["sample_id,cluster"] or [i for i, _ in pairs] != list(range(len(pairs))):
        raise InputError(f"{path} is not a run's labels.csv (a sample_id,cluster header, then the rows 0..n-1)")
    return np.array([k for _, k in pairs], dtype=np.int64)
