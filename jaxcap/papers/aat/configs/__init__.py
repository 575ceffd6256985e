"""The aat configs: ``--config configs/<file>.py:<arg>`` finds them (jaxcap.config_files)."""

from jaxcap import config_files

# The config files import the shared ``configs.common``: the package beside jaxcap, whatever
# the script's folder on sys.path.
config_files.ensure_configs_importable()
