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
    with pytest.raises(ConfigError, match=f"n={bad!r} is not valid") as e: check_int('n', bad, todo='Use n=4.')
    assert str(e.value) == f"n={bad!r} is not valid. n must be an integer >= 1. Use n=4."


def test_check_int_bounds_are_inclusive_and_the_message_names_them():
    import numpy as np
    assert check_int('n', 1) == 1 and check_int('n', 0, least=0) == 0 and check_int('n', 5, most=5) == 5 and check_int('n', np.int64(3)) == 3
    with pytest.raises(ConfigError) as e: check_int('n', 6, least=2, most=5)
    assert str(e.value) == "n=6 is not valid. n must be an integer from 2 to 5."


def test_check_fraction_ends():
    assert check_fraction('p', 0.0) == 0.0 and check_fraction('p', 1.0) == 1.0
    for bad, kw, span in [(1.0, dict(one=False), '[0, 1)'), (0.0, dict(zero=False), '(0, 1]'), (1.5, {}, '[0, 1]'), (-0.1, {}, '[0, 1]'), (True, {}, '[0, 1]')]:
        with pytest.raises(ConfigError) as e: check_fraction('p', bad, todo='Use p=0.5.', **kw)
        assert str(e.value) == f"p={bad!r} is not valid. p must be a fraction in {span}. Use p=0.5."


def test_closest_suggests_near_spellings_then_same_last_part():
    from interpkit.errors import closest
    valid = ['model.layers.0.mlp.up_proj', 'model.layers.0.mlp.down_proj', 'model.layers.1.mlp.up_proj', 'lm_head']
    assert closest('model.layers.0.mlp.up', valid) == ['model.layers.0.mlp.up_proj', 'model.layers.1.mlp.up_proj', 'model.layers.0.mlp.down_proj']
    assert closest('x.up_proj', valid, n=5)[-1] == 'model.layers.1.mlp.up_proj' and 'lm_head' not in closest('x.up_proj', valid)
    assert closest('zzzz', valid) == [] and len(closest('model.layers', valid, n=1)) == 1


def test_errors_say_what_was_given_what_is_valid_and_what_to_do():
    from interpkit.errors import InterpkitError, SiteError
    e = SiteError('x was given.', 'y is valid.', 'Do z.')
    assert (e.given, e.valid, e.todo, str(e)) == ('x was given.', 'y is valid.', 'Do z.', 'x was given. y is valid. Do z.') and isinstance(e, (KeyError, InterpkitError))
    assert str(ConfigError('only given.')) == 'only given.'
    with pytest.raises(ConfigError) as c: check_choice('how', 'zeros', ['zero', 'mean'])
    assert str(c.value) == "how='zeros' is not valid. Valid values: 'zero', 'mean'. Did you mean 'zero'?"
    with pytest.raises(ConfigError) as c: check_choice('how', 'q', ['zero', 'mean'])
    assert str(c.value) == "how='q' is not valid. Valid values: 'zero', 'mean'."
