#include <kvstream/kv_store.hpp>

int main() { return kvstream::StoreConfig{}.validate().ok() ? 1 : 0; }
