"""Record a release's code-file hashes in stable_models/code_hashes.json (what `stable-models verify` checks against).

    python scripts/record_code_hashes.py                         # this checkout's version and code, at a release
    python scripts/record_code_hashes.py --git 73027ca --version 0.1.0   # a past release, from git history

The code files are the ones save_pretrained writes next to a checkpoint: `stable_models/modeling_*.py`. A version is
recorded once; recording it again with other bytes is refused (one version string, one set of files).
"""

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "stable_models" / "code_hashes.json"


def from_git(revision: str) -> dict[str, str]:
    names = subprocess.run(
        ["git", "ls-tree", "--name-only", revision, "stable_models/"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    hashes = {}
    for path in names:
        name = Path(path).name
        if name.startswith("modeling_") and name.endswith(".py"):
            blob = subprocess.run(["git", "show", f"{revision}:{path}"], cwd=ROOT, capture_output=True, check=True)
            hashes[name] = hashlib.sha256(blob.stdout).hexdigest()
    return hashes


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--git", help="a commit of the release (default: the working tree)")
    parser.add_argument("--version", help="its version (default: stable_models.__version__)")
    args = parser.parse_args()
    if args.git:
        if not args.version:
            parser.error("--git needs --version")
        version, hashes = args.version, from_git(args.git)
    else:
        sys.path.insert(0, str(ROOT))
        import stable_models
        from stable_models.verify import installed_code

        version, hashes = args.version or stable_models.__version__, installed_code()
    manifest = json.loads(MANIFEST.read_text()) if MANIFEST.is_file() else {}
    if version in manifest and manifest[version] != hashes:
        raise SystemExit(f"{version} is recorded with other code files: a changed release needs a new version")
    manifest[version] = hashes
    MANIFEST.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    print(f"{MANIFEST.relative_to(ROOT)}: {version}, {len(hashes)} code files")


if __name__ == "__main__":
    main()
