// A shared library that is not a segflow plugin (no segflow_register_stages).
extern "C" int segflow_something_else() { return 42; }
