"""The cache the fixture scripts share (make_aoti_fixtures.py, make_graph_fixtures.py,
make_offload_fixture.py): OUTDIR/.stamp holds a hash of the scripts that make the fixtures and
of what else they depend on (torch's version, ...). When it matches, the fixtures in OUTDIR
are up to date; a rebuild removes it first, so an interrupted one is not taken for done."""

import hashlib
import os
import shutil

_HERE = os.path.dirname(os.path.abspath(__file__))


def digest(scripts, extra):
    """The stamp for `scripts` (file names beside this one) and the text `extra`."""
    h = hashlib.sha256()
    for script in scripts:
        with open(os.path.join(_HERE, script), "rb") as f:
            h.update(f.read())
    h.update(extra.encode())
    return h.hexdigest()


def up_to_date(outdir, want):
    """Whether OUTDIR's stamp is `want`."""
    path = os.path.join(outdir, ".stamp")
    if not os.path.exists(path):
        return False
    with open(path, encoding="utf-8") as f:
        return f.read().strip() == want


def clear(outdir, names):
    """Before a rebuild: OUTDIR exists, without its stamp and without the fixtures `names`
    (only what the calling script makes)."""
    os.makedirs(outdir, exist_ok=True)
    path = os.path.join(outdir, ".stamp")
    if os.path.exists(path):
        os.remove(path)
    for name in names:
        shutil.rmtree(os.path.join(outdir, name), ignore_errors=True)


def mark(outdir, want):
    """After a rebuild: OUTDIR's fixtures are up to date with `want`."""
    with open(os.path.join(outdir, ".stamp"), "w", encoding="utf-8") as f:
        f.write(want + "\n")
