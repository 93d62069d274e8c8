;; adder: the smallest useful capability. Pure functions, no imports, no authority needed.
(module
  (func (export "add") (param $a i32) (param $b i32) (result i32)
    (i32.add (local.get $a) (local.get $b)))
  (func (export "add64") (param $a i64) (param $b i64) (result i64)
    (i64.add (local.get $a) (local.get $b)))
  (func (export "mean") (param $a f64) (param $b f64) (result f64)
    (f64.mul (f64.add (local.get $a) (local.get $b)) (f64.const 0.5))))
