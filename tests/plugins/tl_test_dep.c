/* A library that a test hook library depends on (DT_NEEDED), to test that dependencies are
 * held to the same trust rules as the library that needs them. */
__attribute__((visibility("default"))) int tl_test_dep_value(void);
__attribute__((visibility("default"))) int tl_test_dep_value(void) { return 42; }
