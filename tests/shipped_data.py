"""The public data that ships in ``third_party/data`` (see its README): tests read it from there, or MemSyco-Bench from
``$MEMSYCO_DATA`` when set. It ships with the repository, so a test that needs it fails when it is missing."""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MEMSYCO = Path(os.environ.get("MEMSYCO_DATA", ROOT / "third_party" / "data" / "memsyco"))
LOCOMO = ROOT / "third_party" / "data" / "locomo" / "locomo_dev5.json"
