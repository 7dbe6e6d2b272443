# lit configuration: golden tests of `qforge inspect` plans and of emitted CUDA source.
import os
import sys
import lit.formats

config.name = "qforge"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".test"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.qforge_bin, "tests", "lit")
config.substitutions.append(("%qforge", os.path.join(config.qforge_bin, "tools", "qforge")))
config.substitutions.append(("%recipes", os.path.join(config.qforge_src, "recipes")))
config.substitutions.append(("%inputs", os.path.join(config.qforge_src, "tests", "lit", "Inputs")))
config.substitutions.append(("FileCheck", config.filecheck))
config.substitutions.append(("%python", sys.executable))
config.substitutions.append(("%docs", os.path.join(config.qforge_src, "docs")))
config.environment["QFORGE_CACHE_DIR"] = os.path.join(config.qforge_bin, "lit-cache")
