import sys
from pathlib import Path

# The chunking helpers are shared with the tool-call tests (tests/unit has no packages to import from).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "toolcalls"))
