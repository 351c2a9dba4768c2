"""`import arc_cy` and its first use with the compiled core blocked (its import raises
ImportError): prints the implementation chosen, then the RuntimeWarnings'
messages (a list)."""

import sys
import warnings


class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "arc_cy._core.arc":
            raise ImportError("blocked for the test")


sys.meta_path.insert(0, Block())
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import arc_cy

    implementation = arc_cy.IMPLEMENTATION  # the first use selects it
print(implementation)
print([str(w.message) for w in caught if w.category is RuntimeWarning])
