"Tests of interpkit.viz: the arrays drawn are the arrays given, colour ranges, labels, bad input, and explore's widget."
import matplotlib
matplotlib.use('Agg')
import numpy as np, pandas as pd, pytest, torch
import matplotlib.pyplot as plt
import ipywidgets as widgets
from matplotlib.figure import Figure
from interpkit.errors import ShapeError, ConfigError
from interpkit.viz import heatmap, image_grid, line_plot, explore, as_images, figure_png


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close('all')


def arr(im): return np.asarray(im.get_array())

# --- heatmap ---------------------------------------------------------------------------------------------------------

def test_heatmap_draws_input_and_labels():
    v = torch.randn(3, 5, generator=torch.Generator().manual_seed(0))
    ax = heatmap(v, xlabels=list('abcde'), ylabels=['r0', 'r1', 'r2'], title='T', xlabel='X', ylabel='Y')
    np.testing.assert_array_equal(arr(ax.images[0]), v.numpy())
    assert [t.get_text() for t in ax.get_xticklabels()] == list('abcde')
    assert [t.get_text() for t in ax.get_yticklabels()] == ['r0', 'r1', 'r2']
    assert (ax.get_title(), ax.get_xlabel(), ax.get_ylabel()) == ('T', 'X', 'Y')
    assert len(ax.figure.axes) == 2  # the heatmap and its colour bar


def test_heatmap_dataframe_labels_and_no_colorbar():
    df = pd.DataFrame([[1., 2.], [3., 4.], [5., 6.]], index=['a', 'b', 'c'], columns=['x', 'y'])
    ax = heatmap(df, colorbar=False)
    np.testing.assert_array_equal(arr(ax.images[0]), df.to_numpy())
    assert [t.get_text() for t in ax.get_xticklabels()] == ['x', 'y']
    assert [t.get_text() for t in ax.get_yticklabels()] == ['a', 'b', 'c']
    assert len(ax.figure.axes) == 1


@pytest.mark.parametrize('center', [0., 2.5])
def test_heatmap_center_is_symmetric(center):
    v = np.array([[-1., 0.5], [3., 4.]])
    im = heatmap(v, center=center).images[0]
    d = np.abs(v - center).max()
    assert im.norm.vmin == pytest.approx(center - d) and im.norm.vmax == pytest.approx(center + d)
    assert im.norm.vmax - center == pytest.approx(center - im.norm.vmin)
    assert im.get_cmap().name == 'RdBu_r'


def test_heatmap_annotate_writes_every_value():
    v = np.arange(6.).reshape(2, 3)
    ax = heatmap(v, annotate=True, fmt='.1f')
    assert sorted(t.get_text() for t in ax.texts) == sorted(f'{x:.1f}' for x in v.ravel())


def test_heatmap_draws_on_given_axes():
    fig, ax = plt.subplots()
    assert heatmap(np.eye(2), ax=ax) is ax


def test_heatmap_bad_input():
    with pytest.raises(ShapeError, match='xlabels has 2 labels but values has 4 columns'): heatmap(np.zeros((3, 4)), xlabels=['a', 'b'])
    with pytest.raises(ShapeError, match='ylabels has 4 labels but values has 3 rows'): heatmap(np.zeros((3, 4)), ylabels=list('abcd'))
    with pytest.raises(ShapeError, match=r'shape \(2, 3, 4\)'): heatmap(np.zeros((2, 3, 4)))
    with pytest.raises(ConfigError): heatmap(np.zeros((2, 2)), center=0, vmin=-1)

# --- image_grid ------------------------------------------------------------------------------------------------------

def test_image_grid_n_axes_with_input_images():
    ims = np.random.default_rng(0).normal(size=(5, 4, 6))
    fig = image_grid(ims, titles=list('abcde'), ncols=3)
    assert isinstance(fig, Figure) and len(fig.axes) == 5
    for ax, im, t in zip(fig.axes, ims, 'abcde'):
        np.testing.assert_array_equal(arr(ax.images[0]), im)
        assert ax.get_title() == t
        assert ax.images[0].norm.vmin == pytest.approx(im.min()) and ax.images[0].norm.vmax == pytest.approx(im.max())


def test_image_grid_channels():
    x = torch.rand(2, 3, 4, 5, generator=torch.Generator().manual_seed(0))  # channels first
    fig = image_grid(x)
    for ax, im in zip(fig.axes, x): np.testing.assert_array_equal(arr(ax.images[0]), im.permute(1, 2, 0).numpy())
    y = np.random.default_rng(1).random((2, 4, 5, 3))  # channels last
    for ax, im in zip(image_grid(y).axes, y): np.testing.assert_array_equal(arr(ax.images[0]), im)
    z = np.random.default_rng(2).random((3, 1, 4, 4))  # one channel: greyscale
    for ax, im in zip(image_grid(z).axes, z): np.testing.assert_array_equal(arr(ax.images[0]), im[0])
    lst = [np.ones((2, 2)), np.zeros((3, 3, 3))]  # a list of different sizes
    assert [arr(ax.images[0]).shape for ax in image_grid(lst).axes] == [(2, 2), (3, 3, 3)]


def test_image_grid_symmetric_range():
    ims = np.stack([np.array([[-1., 3.]]), np.array([[-5., 2.]])])
    fig = image_grid(ims, vrange='symmetric')
    assert [(ax.images[0].norm.vmin, ax.images[0].norm.vmax) for ax in fig.axes] == [(-3., 3.), (-5., 5.)]
    assert fig.axes[0].images[0].get_cmap().name == 'seismic'
    fig = image_grid(ims, vrange='symmetric', shared=True)
    assert [(ax.images[0].norm.vmin, ax.images[0].norm.vmax) for ax in fig.axes] == [(-5., 5.)] * 2
    fig = image_grid(ims, shared=True)
    assert [(ax.images[0].norm.vmin, ax.images[0].norm.vmax) for ax in fig.axes] == [(-5., 3.)] * 2
    fig = image_grid(ims, vrange=(-10, 10), cmap='viridis')
    assert fig.axes[1].images[0].norm.vmax == 10 and fig.axes[1].images[0].get_cmap().name == 'viridis'


def test_image_grid_bad_input():
    with pytest.raises(ShapeError, match='titles has 1 labels but there are 2 images'): image_grid(np.zeros((2, 3, 3)), titles=['a'])
    with pytest.raises(ShapeError, match=r'Image 0 has shape \(5, 7, 2\)'): image_grid(np.zeros((2, 5, 7, 2)))
    with pytest.raises(ShapeError, match='images is empty'): image_grid([])
    with pytest.raises(ConfigError, match='Did you mean'): image_grid(np.zeros((1, 3, 3)), vrange='symetric')
    with pytest.raises(ConfigError): image_grid(np.zeros((1, 3, 3)), vrange=(1, 0))
    assert as_images(np.zeros((3, 3)))[0].shape == (3, 3)

# --- line_plot -------------------------------------------------------------------------------------------------------

def test_line_plot_one_line_per_series():
    x = np.array([1., 2., 4., 8.])
    s = {'a': torch.tensor([1., 2., 3., 4.]), 'b': np.array([4., 3., 2., 1.]), 'c': [0., 0., 1., 1.]}
    ax = line_plot(s, x=x, xlabel='x', ylabel='y', title='t', logx=True, markers=True)
    assert len(ax.lines) == 3
    for line, (k, y) in zip(ax.lines, s.items()):
        np.testing.assert_array_equal(line.get_xdata(), x)
        np.testing.assert_array_equal(line.get_ydata(), np.asarray(y, dtype=float))
        assert line.get_label() == k and line.get_marker() == 'o'
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ['a', 'b', 'c']
    assert ax.get_xscale() == 'log' and ax.get_yscale() == 'linear'


def test_line_plot_dataframe_and_default_x():
    df = pd.DataFrame({'p': [1., 2., 3.], 'q': [3., 2., 1.]}, index=[10, 20, 30])
    ax = line_plot(df, logy=True)
    np.testing.assert_array_equal(ax.lines[1].get_xdata(), [10, 20, 30])
    np.testing.assert_array_equal(ax.lines[1].get_ydata(), [3., 2., 1.])
    assert ax.get_yscale() == 'log'
    ax = line_plot({'only': [5., 6.]})
    np.testing.assert_array_equal(ax.lines[0].get_xdata(), [0, 1])


def test_line_plot_bad_input():
    with pytest.raises(ShapeError, match="Series 'a' has 3 values but x has 2"): line_plot({'a': [1, 2, 3]}, x=[1, 2])
    with pytest.raises(ShapeError, match='1-D'): line_plot({'a': np.zeros((2, 2))})
    with pytest.raises(ShapeError): line_plot({})

# --- explore ---------------------------------------------------------------------------------------------------------

def test_explore_defaults_and_updates():
    calls = []
    def draw(n:int=3, scale:float=1.0, kind:str='line', flip=False):
        calls.append(dict(n=n, scale=scale, kind=kind, flip=flip))
        fig, ax = plt.subplots()
        ax.plot(np.arange(n) * scale * (-1 if flip else 1))
        return fig
    w = explore(draw, n=(1, 10), scale=(0., 2., .5), kind=['bar', 'line'])
    assert calls == [dict(n=3, scale=1.0, kind='line', flip=False)]  # fn's defaults, not the slider middles
    assert isinstance(w, widgets.interactive) and isinstance(w.result, Figure)
    np.testing.assert_array_equal(w.result.axes[0].lines[0].get_ydata(), np.arange(3.))
    assert w.png[:8] == b'\x89PNG\r\n\x1a\n'
    ctl = {c.description: c for c in w.children if hasattr(c, 'description') and c.description}
    assert set(ctl) == {'n', 'scale', 'kind'}  # `flip` has no control: it keeps its default
    ctl['n'].value = 7
    assert calls[-1] == dict(n=7, scale=1.0, kind='line', flip=False)
    np.testing.assert_array_equal(w.result.axes[0].lines[0].get_ydata(), np.arange(7.))
    ctl['scale'].value = 2.
    assert calls[-1]['scale'] == 2. and len(calls) == 3
    np.testing.assert_array_equal(w.fig.axes[0].lines[0].get_ydata(), 2 * np.arange(7.))
    assert plt.get_fignums() == []  # every figure was closed after it was shown


def test_explore_without_fn_defaults_and_with_widgets():
    seen = []
    def f(a, b, c=5):
        seen.append((a, b, c))
        return heatmap(np.full((2, 2), a + b + c))
    w = explore(f, a=(0, 10), b=[1, 2], c=widgets.IntSlider(value=1, min=0, max=9))
    assert seen == [(5, 1, 5)]  # middle of the slider, first of the list, fn's default over the widget's value
    w.children[2].value = 8
    assert seen[-1] == (5, 1, 8)
    assert w.fig is w.result.figure


def test_explore_bad_input_and_errors():
    def f(rank:int=2): return heatmap(np.eye(rank))
    with pytest.raises(ConfigError, match="Did you mean 'rank'"): explore(f, rnak=(1, 5))
    def g(x): return None
    with pytest.raises(ConfigError, match="'x' of g has no default and no control"): explore(g)
    def broken(n:int=1): raise RuntimeError('boom')
    with pytest.raises(RuntimeError, match='boom'): explore(broken, n=(0, 3))


def test_explore_fn_that_draws_with_pyplot():
    def f(k:int=2):
        plt.figure(); plt.plot(range(k))
    w = explore(f, k=(1, 4))
    assert w.result is None and w.fig is not None and w.png is not None
    assert plt.get_fignums() == []


def test_figure_png_and_no_global_side_effects():
    before = dict(matplotlib.rcParams)
    heatmap(np.eye(3)); image_grid(np.zeros((2, 3, 3))); line_plot({'a': [1, 2]})
    after = dict(matplotlib.rcParams)
    assert {k for k in before if before[k] != after[k] and k != 'backend'} == set()
    assert figure_png(plt.figure())[:4] == b'\x89PNG'
