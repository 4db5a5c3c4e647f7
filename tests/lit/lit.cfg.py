# lit configuration for Kiln's golden tests. Run through CTest (`ctest -R lit`), which
# passes the tool paths as --param.
import lit.formats

config.name = "kiln"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".kir", ".test"]
config.excludes = ["Inputs", "Output"]
# Keep lit's Output/ scratch folders in the build tree, not the sources.
if lit_config.params.get("exec_root"):
    config.test_exec_root = lit_config.params["exec_root"]

for name in ("kiln", "filecheck", "not"):
    if lit_config.params.get(name) is None:
        lit_config.fatal("missing --param %s=PATH (run the golden tests through ctest)" % name)

config.substitutions.append(("%kiln", lit_config.params["kiln"]))
config.substitutions.append(("FileCheck", lit_config.params["filecheck"]))
config.substitutions.append(("%not", lit_config.params["not"]))
