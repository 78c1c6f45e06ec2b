"""Package set-up: every piece of metadata comes from settings.ini (nbdev 2)."""
from configparser import ConfigParser
import setuptools

config = ConfigParser(delimiters=['='])
config.read('settings.ini', encoding='utf-8')
cfg = config['DEFAULT']

licenses = {'apache2': 'Apache-2.0', 'mit': 'MIT'}  # SPDX expressions
statuses = ['1 - Planning', '2 - Pre-Alpha', '3 - Alpha', '4 - Beta', '5 - Production/Stable', '6 - Mature', '7 - Inactive']
lic = licenses[cfg['license']]
min_python = cfg['min_python']
py_versions = ['3.11']   # the versions the tests ran on

def reqs(key): return cfg.get(key, '').split()
extras = {name: reqs(f'{name}_requirements') for name in cfg.get('extras', '').split()}
extras['all'] = sorted({r for rs in extras.values() for r in rs})
extras['dev'] = extras['all'] + reqs('dev_requirements')
extras['bench'] = reqs('bench_requirements')

setuptools.setup(
    name=cfg['lib_name'],
    version=cfg['version'],
    license=lic,
    classifiers=[
        'Development Status :: ' + statuses[int(cfg['status'])],
        'Intended Audience :: ' + cfg['audience'].title(),
        'Natural Language :: ' + cfg['language'].title(),
    ] + ['Programming Language :: Python :: ' + v for v in py_versions[py_versions.index(min_python):]],
    url=cfg['git_url'],
    packages=setuptools.find_packages(include=['interpkit', 'interpkit.*']),
    include_package_data=True,
    package_data={'interpkit': ['assets/*']},
    install_requires=reqs('requirements'),
    extras_require=extras,
    python_requires='>=' + min_python,
    long_description=open('README.md', encoding='utf-8').read(),
    long_description_content_type='text/markdown',
    zip_safe=False,
    entry_points={'nbdev': [f"{cfg['lib_path']}={cfg['lib_path']}._modidx:d"], 'console_scripts': cfg.get('console_scripts', '').split()},
    author=cfg['author'], author_email=cfg['author_email'],
    description=cfg['description'], keywords=cfg['keywords'],
)
