import {expect} from 'vitest'

type ErrorClass<E extends Error> = new (...args: never[]) => E

/** The error `p` rejects with, asserted to be a `cls` (a resolved promise fails the test). */
export async function rejection<E extends Error = Error>(p: Promise<unknown>, cls: ErrorClass<E> = Error as unknown as ErrorClass<E>): Promise<E> {
  const err = await p.then(
    () => null,
    (e: unknown) => e,
  )
  expect(err).toBeInstanceOf(cls)
  return err as E
}

/** The error `fn` throws, asserted to be a `cls` (returning normally fails the test). */
export function thrown<E extends Error = Error>(fn: () => unknown, cls: ErrorClass<E> = Error as unknown as ErrorClass<E>): E {
  let err: unknown = null
  try {
    fn()
  } catch (e) {
    err = e
  }
  expect(err, 'expected a throw').toBeInstanceOf(cls)
  return err as E
}
