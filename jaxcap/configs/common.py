"""The shared config helpers under their first name: this module is :mod:`jaxcap.config_common`.

jaxcap's own config files import ``from jaxcap import config_common as common``; a config file
of your own written as ``from configs import common`` keeps working (``jaxcap.config_files``
makes ``configs`` importable before it runs a config file) and gets the same module object.
"""

import sys

from jaxcap import config_common

sys.modules[__name__] = config_common
