"Tests of interpkit.errors' checks that the paper modules share."
import warnings
import pytest
from interpkit.errors import ConfigError, check_choice, check_int, check_fraction


def test_check_choice_maps_an_old_spelling_with_a_warning():
    with pytest.warns(FutureWarning, match="variant='centre' is now spelled variant='center'"):
        assert check_choice('variant', 'centre', ('plain', 'center'), renamed={'centre': 'center'}) == 'center'
    with warnings.catch_warnings(): warnings.simplefilter('error'); assert check_choice('variant', 'center', ('plain', 'center'), renamed={'centre': 'center'}) == 'center'
    with pytest.raises(ConfigError, match="Did you mean 'center'"): check_choice('variant', 'centr', ('plain', 'center'), renamed={'centre': 'center'})


@pytest.mark.parametrize('bad', [0, -1, 1.5, True, '3', None])
def test_check_int_refuses_what_is_not_a_positive_int(bad):
    with pytest.raises(ConfigError, match=f"n={bad!r} is not valid"): check_int('n', bad)
    assert check_int('n', 3) == 3 and check_int('n', 0, least=0) == 0


def test_check_fraction_ends():
    assert check_fraction('p', 0.0) == 0.0 and check_fraction('p', 1.0) == 1.0
    for bad, kw in [(1.0, dict(one=False)), (0.0, dict(zero=False)), (1.5, {}), (-0.1, {}), (True, {})]:
        with pytest.raises(ConfigError): check_fraction('p', bad, **kw)
