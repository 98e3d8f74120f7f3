// Package badgerstore implements runtime.Store on an embedded Badger v4
// database.
package badgerstore
