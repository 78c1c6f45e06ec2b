"Tests of interpkit.report: claims recorded by the notebooks, stale records, and the Reproduction report built from them."
import json
import pytest
import interpkit.report as report
from interpkit.errors import ConfigError
from interpkit.report import RECORDS_ENV, Claim, load_claims, record_claim, report_markdown, report_table, stale_claims

ARGS = dict(claim='Two and two make four.', paper_value='4', setting='integers', verdict='reproduced')

@pytest.fixture
def records(tmp_path, monkeypatch):
    "A records folder that `record_claim` writes to, each paper's file started afresh."
    monkeypatch.setenv(RECORDS_ENV, str(tmp_path))
    monkeypatch.setattr(report, '_started', set())
    return tmp_path

def test_nothing_is_written_without_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv(RECORDS_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    c = record_claim('toy', 'sum', ours=4, **ARGS)
    assert isinstance(c, Claim) and c.ours == 4.0 and isinstance(c.ours, float) and list(tmp_path.iterdir()) == []

def test_a_paper_file_holds_every_claim_of_the_run_and_starts_afresh(records, monkeypatch):
    record_claim('toy', 'a', ours=1, **ARGS)
    record_claim('toy', 'b', ours=2, **{**ARGS, 'verdict': 'partly'}, reason='only one case', rtol=0.05)
    record_claim('other', 'c', ours=3, **ARGS)
    saved = json.loads((records/'toy.json').read_text())
    assert sorted(saved) == ['a', 'b'] and saved['b'] == dict(paper='toy', key='b', ours=2.0, reason='only one case', rtol=0.05, **{**ARGS, 'verdict': 'partly'})
    assert sorted(load_claims(records)) == ['other', 'toy']
    monkeypatch.setattr(report, '_started', set())              # a new process: the first claim starts the file again
    record_claim('toy', 'b', ours=5, **ARGS)
    assert list(json.loads((records/'toy.json').read_text())) == ['b']

@pytest.mark.parametrize('kw,msg', [(dict(verdict='partly'), 'says why'), (dict(verdict='reproducd'), "Did you mean 'reproduced'"),
                                    (dict(key='a b'), 'page anchor'), (dict(key=''), 'page anchor'), (dict(paper='x/y'), 'page anchor'),
                                    (dict(ours=float('inf')), 'finite'), (dict(rtol=1.0), 'relative tolerance'), (dict(rtol=-0.1), 'relative tolerance')])
def test_bad_claims_are_refused_before_anything_is_written(records, kw, msg):
    args = dict(paper='toy', key='k', ours=1.0, **ARGS) | kw
    with pytest.raises(ConfigError, match=msg): record_claim(**args)
    assert not (records/'toy.json').exists()

def _folder(tmp_path, name, claims):
    d = tmp_path/name
    d.mkdir()
    for paper, cs in claims.items():
        (d/f'{paper}.json').write_text(json.dumps({k: dict(paper=paper, key=k, reason='', rtol=1e-3, **ARGS) | v for k, v in cs.items()}))
    return d

def test_stale_claims_name_each_difference(tmp_path):
    old = _folder(tmp_path, 'old', {'toy': {'a': dict(ours=1.0), 'gone': dict(ours=2.0), 'moved': dict(ours=10.0, rtol=0.01)}, 'untouched': {'x': dict(ours=1.0)}})
    new = _folder(tmp_path, 'new', {'toy': {'a': dict(ours=1.0009, setting='other'), 'added': dict(ours=3.0), 'moved': dict(ours=10.2, rtol=0.01)}})
    lines = stale_claims(new, old)
    assert len(lines) == 4, lines
    assert any(l.startswith('toy/added: a new claim') for l in lines) and any(l.startswith('toy/gone: recorded, but') for l in lines)
    assert any(l.startswith("toy/a: setting is now 'other'") for l in lines)             # 1.0009 vs 1.0 is within rtol 1e-3: only the text
    assert any(l.startswith('toy/moved: ours is now 10.2, recorded 10') and 'allowed: 0.1' in l for l in lines)
    assert not any('untouched' in l for l in lines)                                       # a paper the run did not record is not stale
    assert stale_claims(new, new) == []
    within = _folder(tmp_path, 'within', {'toy': {'moved': dict(ours=10.09, rtol=0.01)}})
    assert stale_claims(within, _folder(tmp_path, 'ref', {'toy': {'moved': dict(ours=10.0, rtol=0.01)}})) == []

def test_the_report_follows_the_pages_order_and_links_each_claim(tmp_path):
    d = _folder(tmp_path, 'r', {'zeta': {'z': dict(ours=1.0)}, 'alpha': {'a': dict(ours=0.123456, verdict='not reproduced', reason='it | fails')},
                                'mid': {'m': dict(ours=2.0)}})
    t = report_table(d, pages={'mid': 'papers/mid-page.html', 'zeta': 'papers/zeta.html'})
    assert t.paper.tolist() == ['mid', 'zeta', 'alpha']                                   # the pages' order, then the rest alphabetically
    assert t['where'].tolist() == ['[m](papers/mid-page.html#claim-m)', '[z](papers/zeta.html#claim-z)', '[a](papers/alpha.html#claim-a)']
    assert t.ours.tolist() == ['2', '1', '0.1235'] and t.verdict.tolist()[2] == 'not reproduced: it | fails'
    md = report_markdown(t).splitlines()
    assert md[0] == '| paper | claim | paper says | ours | setting | verdict | where |' and md[1] == '|---|---|---|---|---|---|---|'
    assert len(md) == 5 and 'not reproduced: it \\| fails' in md[4] and md[4].count(' | ') == 6   # the '|' in a cell is escaped
    assert report_table(tmp_path/'none').empty

def test_the_claim_shows_its_anchor_and_escapes_text():
    c = Claim('toy', 'k-1', 'a < b', 'p', 1.5, 's & t', 'partly', 'why')
    h = c._repr_html_()
    assert h.startswith('<a id="claim-k-1"></a>') and 'a &lt; b' in h and 's &amp; t' in h and '(partly)' in h and 'why' in h
    assert 'Claim toy/k-1: partly' in repr(c)

def test_tolerance_edges(records, tmp_path):
    "rtol=0 is allowed (an exact count); two records are compared with the larger of their two rtols (a widened tolerance is not stale)."
    assert record_claim('toy', 'count', ours=3, rtol=0, **ARGS).rtol == 0.0
    old = _folder(tmp_path, 'old', {'toy': {'x': dict(ours=10.0, rtol=0.001)}})
    new = _folder(tmp_path, 'new', {'toy': {'x': dict(ours=10.05, rtol=0.01)}})
    assert stale_claims(new, old) == []                                   # 0.05 <= 0.01 * 10
    assert len(stale_claims(_folder(tmp_path, 'tight', {'toy': {'x': dict(ours=10.05, rtol=0.001)}}), old)) == 1
