package symm

// sysMemfdCreate is memfd_create(2)'s number; the syscall package predates it.
const sysMemfdCreate = 319
