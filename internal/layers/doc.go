// Package layers holds the test that keeps the module's layering: every
// package's doc.go ends with an "Imports:" line naming what the package may
// import (this module's packages by their path in it, other modules by
// their path; the standard library always), and the test fails when a
// package's code imports anything else, or a package has no such line.
//
// Imports: nothing but the standard library.
package layers
